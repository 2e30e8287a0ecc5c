"""The `orgs` command group (create, list, members, invite, role, remove, rename, delete, billing), and the
organisation in which the key and webhook commands act for a member (`--org SLUG`)."""

import contextlib

import click

from accounts import users
from billing import customers
from cli.commands import CommandGroup, find_user, warn_if_servers_may_not_hear
from mail import outbox
from models import ROLES, ApiKey, Membership, Organisation, personal_organisation
from orgs import invitations, members, orgadmin, organisations, roles

orgs_cli = CommandGroup("orgs", help="Manage organisations and their members.")
org_option = click.option("--org", "org_slug", metavar="SLUG",
                          help="The organisation, of which the user must be a member (default: its personal one).")
# How a refusal names what the member's role does not allow.
ACTION_WORDS = {roles.VIEW: "see its keys and endpoints", roles.KEY_CREATE: "create keys",
                roles.WEBHOOK_MANAGE: "add webhook endpoints"}


def find_organisation(slug):
    """The organisation with this slug (or, for 30 days after a rename, its former one), or a
    ClickException that says there is none."""
    org = orgadmin.find(slug)
    if org is None:
        raise click.ClickException(f"There is no organisation with the slug {slug!r}.")
    return org


def not_a_member(user, org):
    return click.ClickException(f"{user.username} is not a member of {org.slug}.")


def organisation_for(user, org_slug, action):
    """The organisation a command acts in for the user: the one with this slug (None: the user's
    personal one). The operator is bound by the member's role as a page would be, since what is
    made records the member as its creator: ClickException unless the user is a member whose role
    allows the action (orgs/roles.py)."""
    org = find_organisation(org_slug) if org_slug is not None else personal_organisation(user.id)
    if org is None:
        raise users.AccountGone()
    membership = Membership.get_or_none((Membership.org == org.id) & (Membership.user == user.id))
    if membership is None:
        raise not_a_member(user, org)
    if not roles.allows(membership.role, action):
        raise click.ClickException(f"{user.username} is {membership.role} of {org.slug}; a {membership.role} "
                                   f"cannot {ACTION_WORDS[action]}.")
    return org


@contextlib.contextmanager
def refusals_as_sentences(org, user=None):
    """What the organisation's rules refuse (a role, an address, the last owner, a cap) ends the
    command with its sentence."""
    try:
        yield
    except members.NotMember:
        raise not_a_member(user, org) from None
    except (ValueError, members.LastOwner) as refused:
        raise click.ClickException(str(refused)) from None
    except organisations.OrganisationGone:
        raise click.ClickException(f"The organisation {org.slug} was deleted meanwhile.") from None


@orgs_cli.command("create")
@click.argument("name")
@click.option("--owner", "owner_name", required=True, metavar="USERNAME", help="Its first owner.")
def create_command(name, owner_name):
    """Create an organisation owned by USERNAME; its slug is made from NAME."""
    owner = find_user(owner_name)
    try:
        org = members.create(name, owner)
    except ValueError as refused:
        raise click.ClickException(str(refused)) from None
    click.echo(f"Created organisation {org.slug} ({org.name!r}), owned by {owner.username}.")


@orgs_cli.command("list")
@click.argument("username", required=False)
def list_command(username):
    """One line per organisation: slug, name (tab-separated), by slug; with USERNAME, the user's
    organisations (its personal one first) with its role in each."""
    if username is None:
        for org in Organisation.select().order_by(Organisation.slug):
            click.echo(f"{org.slug}\t{org.name}")
        return
    for membership in members.memberships_of(find_user(username)):
        click.echo(f"{membership.org.slug}\t{membership.org.name}\t{membership.role}")


@orgs_cli.command("members")
@click.argument("slug")
def members_command(slug):
    """One line per member, owners first: USER_ID, username, role (tab-separated)."""
    for membership in members.members(find_organisation(slug).id):
        click.echo(f"{membership.user_id}\t{membership.user.username}\t{membership.role}")


@orgs_cli.command("invite")
@click.argument("slug")
@click.argument("email")
@click.option("--role", required=True, help=f"The role it joins with: {', '.join(ROLES)}.")
def invite_command(slug, email, role):
    """Invite EMAIL to join with ROLE; the link (valid 7 days, once) is printed alone on the last
    line, and mailed when PUBLIC_URL is set."""
    org = find_organisation(slug)
    with refusals_as_sentences(org):
        invitation, link = invitations.invite(org.id, email, role)
    if link.startswith("/"):
        sent = "No mail was sent, as PUBLIC_URL is not set; pass this link on"
    elif not outbox.enabled():
        sent = "No mail was sent, as MAIL_URL is off; pass this link on"
    else:
        sent = "The link was mailed to that address"
    click.echo(f"Invited {invitation.email} to {org.slug} as {role}. {sent}: it works once, for "
               f"{invitations.LIFETIME.days} days, for an account with that address.")
    click.echo(link)


@orgs_cli.command("role")
@click.argument("slug")
@click.argument("username")
@click.argument("role")
def role_command(slug, username, role):
    """Give a member ROLE (owner, admin, developer or viewer); the last owner keeps its own."""
    org, user = find_organisation(slug), find_user(username)
    with refusals_as_sentences(org, user):
        before = members.member(org.id, user.id).role
        members.change_role(org.id, user.id, role)
    if before == role:
        click.echo(f"{user.username} is already {role} of {org.slug}.")
    else:
        click.echo(f"{user.username} is now {role} of {org.slug} (was {before}).")


@orgs_cli.command("remove")
@click.argument("slug")
@click.argument("username")
@click.option("--revoke-keys", is_flag=True, help="Also revoke every active key the member created there.")
def remove_command(slug, username, revoke_keys):
    """Remove a member (not the last owner); the keys it created there keep working unless --revoke-keys."""
    org, user = find_organisation(slug), find_user(username)
    with refusals_as_sentences(org, user):
        revoked = members.remove(org.id, user.id, revoke_keys=revoke_keys)
    if revoke_keys:
        click.echo(f"Removed {user.username} from {org.slug}. Keys it created there, now revoked: {revoked}.")
        if revoked:
            warn_if_servers_may_not_hear()
    else:
        working = ApiKey.active_in(org.id, created_by=user.id).count()
        click.echo(f"Removed {user.username} from {org.slug}. Keys it created there, still working: {working}.")


@orgs_cli.command("rename")
@click.argument("slug")
@click.argument("name")
def rename_command(slug, name):
    """Rename an organisation; its slug follows, and the former one finds it for 30 days."""
    org = find_organisation(slug)
    try:
        renamed = orgadmin.rename(org.id, name)
    except ValueError as refused:
        raise click.ClickException(str(refused)) from None
    click.echo(f"Renamed {org.slug} to {renamed.name!r}; its slug is {renamed.slug}.")


@orgs_cli.command("delete")
@click.argument("slug")
@click.option("--yes", is_flag=True, help="Confirm: its keys are revoked, and it cannot be brought back.")
def delete_command(slug, yes):
    """Delete an organisation (not a personal one): every key revoked first, then its endpoints,
    invitations and memberships end."""
    org = find_organisation(slug)
    if not yes:
        raise click.ClickException(f"Deleting {org.slug} revokes its keys and cannot be undone; add --yes to confirm.")
    revoked = ApiKey.active_in(org.id).count()
    try:
        orgadmin.delete(org.id)
    except orgadmin.PersonalOrganisation as refused:
        raise click.ClickException(str(refused)) from None
    click.echo(f"Deleted {org.slug}; {revoked} active key{'' if revoked == 1 else 's'} revoked.")
    if revoked:
        warn_if_servers_may_not_hear()


@orgs_cli.command("billing")
@click.argument("slug")
@click.option("--customer", metavar="ID", help="Its id in the billing system: a Stripe customer, a Lago external "
              "subscription id, an OpenMeter or CloudEvents subject.")
@click.option("--remove", is_flag=True, help="Stop exporting its usage.")
def billing_command(slug, customer, remove):
    """Give an organisation its billing customer: its usage from the current hour on is exported."""
    org = find_organisation(slug)
    if (customer is not None) == remove:
        raise click.ClickException("Give either --customer ID or --remove.")
    try:
        row = customers.set_customer(org.id, None if remove else customer)
    except ValueError as refused:
        raise click.ClickException(str(refused)) from None
    if row is None:
        click.echo(f"{org.slug} is not exported.")
    elif row.customer is None:
        click.echo(f"{org.slug} is exported no more after the hour under way, which still goes out.")
    else:
        click.echo(f"{org.slug} is exported as customer {row.customer}: its hours from "
                   f"{customers.first_hour_of(org.id, row.customer):%Y-%m-%d %H:00} UTC on.")
